"""A sparse parameter server over gRPC (job.py), run with the TensorFlow venv's grpcio."""
