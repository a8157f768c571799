"""Workers of the frameworks other than PyTorch (spec.framework): ``tf`` (TensorFlow with
MultiWorkerMirroredStrategy), ``ray`` (a Ray cluster and its driver, Ray Train's workers). Each
is started by the same launchers as a PyTorch worker (the
elastic agent here, the pod launcher in a pod, or the framework's own operator) and writes the
same run-directory files (gpufleet.runtime.rundir), so ``gpufleet run`` and ``status`` read
them alike. Importing these packages imports neither torch nor the framework."""

__all__ = ["FRAMEWORK_BUILDS", "FRAMEWORK_PACKAGES"]

# The package each framework's workers import, also the name of the extra that installs it.
FRAMEWORK_PACKAGES = {"tensorflow": "tensorflow", "ray": "ray", "horovod": "horovod"}
# How to install a framework that its extra alone does not bring. Horovod's extra holds its
# dependencies; Horovod is built from source for the environment's torch.
FRAMEWORK_BUILDS = {
    "horovod": "Horovod built for this environment's torch: scripts/build-horovod.sh install "
    "<venv> (docs/frameworks.md, Horovod)",
}
