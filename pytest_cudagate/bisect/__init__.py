"""`cudagate bisect`: the commit that made a kernel slower, found among those that re-approve it."""
