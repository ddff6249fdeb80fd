"""genbatch.manifests"""
