"""Data generators: RadiX-Net networks and MNIST-derived input images."""
