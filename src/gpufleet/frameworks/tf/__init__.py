"""The TensorFlow worker: ``python -m gpufleet.frameworks.tf`` trains the digits workload in
Keras with tf.distribute.MultiWorkerMirroredStrategy (``train``), its cluster from TF_CONFIG
(``cluster``), its checkpoints tf.train.Checkpoint's in gpufleet's step directories with their
integrity markers (``checkpoints``)."""
