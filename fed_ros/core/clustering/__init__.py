"""Clustering math of the papers: CUA and SRB (FedDRMan), Jeffreys soft clusters (FeDepth),
novelty federations (RND), k-means and cluster-validity measures."""
