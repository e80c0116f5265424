"""On-disk formats: atomic writes, checksums, downloads, Parquet, safetensors, the feature
cache, splits, label tables, metrics files, the hashes of the user's data files and the safe
reading of params.yaml."""
