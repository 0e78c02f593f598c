"""`python -m unigrad.onnx MODEL.onnx`: the command line of unigrad.onnx (see cli.py)."""
from unigrad.onnx.cli import main

raise SystemExit(main())
