"""genbatch.runner"""
