"""genbatch.jobs"""
