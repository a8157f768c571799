"""Workers of the frameworks other than PyTorch (spec.framework): ``tf`` (TensorFlow with
MultiWorkerMirroredStrategy). Each is started by the same launchers as a PyTorch worker (the
elastic agent here, the pod launcher in a pod, or the framework's own operator) and writes the
same run-directory files (gpufleet.runtime.rundir), so ``gpufleet run`` and ``status`` read
them alike. Importing these packages imports neither torch nor the framework."""
