"""Label-sharded multi-process runs on torch.distributed (README, "Beyond one process"): the
processes and each one's labels (:mod:`.world`), the collective autograd operations a sharded
loss is built from (:mod:`.ops`), the label-chunked logits a full loss streams
(:mod:`.chunked_logits`, :mod:`.chunk_kernels`) and the torchrun launch (:mod:`.launch`). The
output layer's shards are :mod:`tailkit.output.shards`, prediction over them
:mod:`tailkit.evaluation.predict_sharded` and the cross-rank top-k merge
:mod:`tailkit.evaluation.topk_merge`: this package sits below the output layer, evaluation
and training, which all build on it."""
