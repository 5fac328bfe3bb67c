def save(obj, path):
    raise NotImplementedError


def load(path, map_location=None):
    raise NotImplementedError
