"""The GPU check (`make device-check`): prepared here (bundle), run on a device (check).

  bundle       the offline bundle: pruned patched tree, CPU variants, wheels, fixtures, driver (PREPARE)
  check        the driver on the device or in the CPU dry run (RUN): stages through one runner
  context      the run context every stage function shares
  backend      stages: build, fallback, archs, lossless
  crossparity  stage parity: like with like on the device, the host CPU against float64
  judge        the verdicts of the parity stage
  block        stages: realsize (with its per-node profile), vb-forms
  profile      where the block's time goes, per part, each against its floor
  host         stages: host (lscpu, AMX, the #18099 reproducer), threads (llama-bench rows)
  variants     CPU builds of the base and single stacks (prepared here, built there)
  models       the background writer of the model files
  toolkit      the CMake options a pip-assembled CUDA toolkit needs
  report       report.md
"""
