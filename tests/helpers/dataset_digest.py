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

    Raises:
        FileNotFoundError: When ``root`` is not a folder or holds no file.
    """
    files = [osp.join(folder, name) for folder, _, names in sorted(os.walk(root))
             for name in sorted(names)]
    if not files:
        what = 'holds no file' if osp.isdir(root) else 'is not a folder'
        raise FileNotFoundError(f'root={root!r} {what}; expected the root of a '
                                'generated dataset.')
    digest = hashlib.sha256()
    for path in files:
        digest.update(osp.relpath(path, root).encode())
        if path.endswith('.json'):
            with open(path, 'rb') as f:
                digest.update(f.read())
        else:
            digest.update(cv2.imread(path, cv2.IMREAD_UNCHANGED).tobytes())
    return digest.hexdigest()
