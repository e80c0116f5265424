"""Label-sharded multi-process training and evaluation on torch.distributed (issue 18): the
process group and each rank's label range (:mod:`.world`), the collective autograd operations
a sharded loss is built from (:mod:`.ops`) and the cross-rank top-k merge (:mod:`.topk`)."""
