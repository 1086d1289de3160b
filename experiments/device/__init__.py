"""A GPU machine: pack what it lacks (`device_kit`), then check the CUDA paths there
(`cuda_check`, run by `experiments/device_session.sh` with the calibrations)."""
