"""genbatch.parallel"""
