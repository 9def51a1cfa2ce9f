"""Thread settings shared by the PyTorch comparisons of `make bench`."""
import ctypes


def set_blas_threads(threads):
    """OpenBLAS's thread count, which torch.set_num_threads leaves alone (it sets OpenMP's and
    MKL's); without this, torch's sgemm used 2 threads in the 1-thread rows. Returns whether an
    OpenBLAS was found in the process."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libopenblas" in line}
    for path in sorted(paths):
        ctypes.CDLL(path).openblas_set_num_threads(threads)
    return bool(paths)
