import sys

try:
    from .cli import main
except MemoryError:  # the standard library's modules do not fit under a memory limit
    print("cvxtransformer: error: not enough memory to start; raise the memory limit (ulimit -v, prlimit --as)",
          file=sys.stderr)
    sys.exit(2)

sys.exit(main())
