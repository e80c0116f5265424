"""Label-sharded multi-process training and evaluation on torch.distributed (README, "Beyond one
process"): the processes and each one's labels (:mod:`.world`), the collective autograd
operations a sharded loss is built from (:mod:`.ops`), the cross-rank top-k merge (:mod:`.topk`),
the output layer's shards (:mod:`.layer`), prediction over them (:mod:`.predict`) and the
torchrun launch (:mod:`.launch`)."""
