"""`python -m unigrad.llm`: complete a prompt, chat, or serve the model (cli.py)."""
import time

START = time.perf_counter()  # before the imports: first_token_s counts unigrad's import too

import sys  # noqa: E402

from unigrad.llm.cli import main  # noqa: E402

if __name__ == "__main__":
  sys.exit(main(start=START))
