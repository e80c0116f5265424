"""What the stages share: the resolved experiment, subsampling, featurizing, the model files
and trained runs, prediction on new rows, code fingerprints, the DVC stage address, the
non-finite checks and the parallel repro."""
