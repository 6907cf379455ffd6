"""Fill the models volume (engine: gpu): each model given, its tokenizer first, then its weights.

Run by the chart's models Job in the SGLang image (which carries huggingface_hub) as
`python3 -c <this> <hf id> ...`. A model goes to /models/<org>--<name>. Marks written when a part is whole:
.tokenizer-ready (the edge and stages count with it) and .weights-ready (an engine loads them); the pods that
read them wait for the marks. A gated model needs HF_TOKEN (from a Secret). A rerun resumes what is there.
"""

import sys
from pathlib import Path

from huggingface_hub import snapshot_download

TOKENIZER = ["*.json", "*.jinja", "tokenizer*", "*.tiktoken"]  # no weights: seconds, not minutes


def main(repos: list[str], root: Path = Path("/models")) -> None:
    for part, patterns in (("tokenizer", TOKENIZER), ("weights", None)):
        for repo in repos:
            folder = root / repo.replace("/", "--")
            mark = folder / f".{part}-ready"
            if mark.exists():
                print(f"{repo}: {part} already on the volume", flush=True)
                continue
            print(f"{repo}: fetching its {part} into {folder}", flush=True)
            snapshot_download(repo, local_dir=folder, allow_patterns=patterns)
            mark.touch()
    print("every model is on the volume", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
