"""The training core: row-sparse output layer, its optimisers, the loop, checkpoints."""
