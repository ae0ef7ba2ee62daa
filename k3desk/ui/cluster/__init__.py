"""Several machines: the Cluster page, the cluster engine in the Engine view, attached servers."""
