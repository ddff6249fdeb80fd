"""genbatch.io"""
