"""What was approved and when: the ledger, `cudagate approve`, the diff of two versions, and the release a release gate compares with."""
