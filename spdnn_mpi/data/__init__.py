"""Package data: the pruned MNIST classifiers in ``models/`` (see ``generators.mnist_models``)."""
