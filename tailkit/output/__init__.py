"""The output layer: the (C, D) label table every loss scores against, kept row-sparse so that a
sampled step touches only the rows it used; its optimisers (row-sparse SGD and Adagrad, their
schedules) and compiled kernels, and its label shards across processes. Training, evaluation
and the distributed runs all build on it, so it sits below them."""
