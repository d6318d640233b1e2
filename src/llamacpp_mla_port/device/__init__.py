"""The GPU check (`make device-check`): prepared here (bundle), run on a device (check).

  bundle   the offline bundle: pruned patched tree, wheels, fixtures, driver (PREPARE)
  check    the driver on the device or in the CPU dry run (RUN), the real-size models
  judge    parity bounds on another backend than the CPU they were measured on
  toolkit  the CMake options a pip-assembled CUDA toolkit needs
  report   report.md
"""
