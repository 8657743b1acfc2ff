"""A content digest of a generated dataset, to compare or pin its files."""
import hashlib
import os
import os.path as osp

import cv2


def dataset_digest(root: str) -> str:
    """SHA-256 over a dataset's relative paths, JSON files and decoded images.

    Images are hashed as decoded pixels, so the digest depends on the data,
    not on the PNG/JPEG encoder's byte stream.

    Args:
        root (str): Dataset root; every file below it is included.

    Returns:
        str: The hexadecimal digest.
    """
    digest = hashlib.sha256()
    for folder, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            path = osp.join(folder, name)
            digest.update(osp.relpath(path, root).encode())
            if name.endswith('.json'):
                with open(path, 'rb') as f:
                    digest.update(f.read())
            else:
                digest.update(cv2.imread(path, cv2.IMREAD_UNCHANGED).tobytes())
    return digest.hexdigest()
