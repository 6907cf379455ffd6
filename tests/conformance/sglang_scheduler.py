"""A scripted stand-in for SGLang's scheduler process: everything else of the server is SGLang's own code.

Runs inside the SGLang environment as `launch_server(run_scheduler_process_func=run)`. It speaks the scheduler's
side of SGLang's IPC as its own scheduler does (managers/scheduler.py, scheduler_components/output_streamer.py):
tokenized requests in; a batch of token ids per step out to SGLang's detokenizer; requests ended outside the
stream (aborted while queued, refused for a full queue) as an AbortReq to the tokenizer manager. What a
request does is scripted by markers in its prompt; every request and abort it receives is written to a log.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from http import HTTPStatus

import zmq
from sglang.srt.constants import HEALTH_CHECK_RID_PREFIX
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOutput,
    TokenizedGenerateReqInput,
    sock_recv,
    sock_send,
)
from sglang.srt.managers.schedule_batch import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_TOKEN,
    INIT_INCREMENTAL_DETOKENIZATION_OFFSET,
)
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from sglang.srt.utils.network import get_zmq_socket

STEP_S = 0.02  # one decode step: every running request gets a token
MAX_TOTAL_TOKENS = 65536
MAX_INPUT = 8000


@dataclass
class Req:
    msg: TokenizedGenerateReqInput
    text: str
    reply: list[int]
    queued_until: float
    cached: int
    output: list[int] = field(default_factory=list)
    # Req.init_incremental_detokenize's state: the prompt's last ids and the output, sent to the detokenizer
    # as they grow, and where the output starts in them
    surr: list[int] = field(default_factory=list)
    read_offset: int = 0
    sent_ids: int = 0
    sent_out: int = 0
    finish: dict | None = None

    @property
    def rid(self) -> str:
        return self.msg.rid


def marker(text: str, name: str) -> str | None:
    found = re.search(rf"\[\[{name}(?:=([0-9.]+))?\]\]", text)
    return None if found is None else (found.group(1) or "")


class Scripted:
    def __init__(self, server_args, port_args, log_path: str) -> None:
        ctx = zmq.Context(2)
        self.recv = get_zmq_socket(ctx, zmq.PULL, port_args.scheduler_input_ipc_name, False)
        self.to_tokenizer = get_zmq_socket(ctx, zmq.PUSH, port_args.tokenizer_ipc_name, False)
        self.to_detokenizer = get_zmq_socket(ctx, zmq.PUSH, port_args.detokenizer_ipc_name, False)
        self.tokenizer = get_tokenizer(server_args.tokenizer_path or server_args.model_path)
        self.eos = self.tokenizer.eos_token_id
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.seen: list[list[int]] = []  # inputs served: the radix cache's prefixes
        self.log = open(log_path, "a", buffering=1)

    def record(self, **entry) -> None:
        self.log.write(json.dumps({"t": time.time(), **entry}) + "\n")

    def cached_prefix(self, ids: list[int]) -> int:
        best = 0
        for old in self.seen:
            n = 0
            for a, b in zip(old, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    # -- requests in -----------------------------------------------------------------------------
    def receive(self) -> None:
        while self.recv.poll(0):
            msg = sock_recv(self.recv)
            if isinstance(msg, TokenizedGenerateReqInput):
                self.admit(msg)
            elif isinstance(msg, AbortReq):
                self.abort(msg)
            else:
                self.record(kind="other", type=type(msg).__name__)

    def admit(self, msg: TokenizedGenerateReqInput) -> None:
        ids = list(msg.input_ids)
        text = self.tokenizer.decode(ids)
        params = msg.sampling_params
        self.record(
            kind="generate",
            rid=msg.rid,
            priority=msg.priority,
            max_new_tokens=params.max_new_tokens,
            prompt_tokens=len(ids),
            health=msg.rid.startswith(HEALTH_CHECK_RID_PREFIX),
        )
        queued = marker(text, "queue")
        tokens = marker(text, "tokens")
        reply = self.tokenizer.encode(os.environ["PARLEY_SCRIPTED_REPLY"], add_special_tokens=False)
        if tokens:
            reply = (reply * (int(tokens) // len(reply) + 1))[: int(tokens)]
        req = Req(
            msg,
            text,
            reply + [self.eos],
            time.monotonic() + float(queued or 0),
            self.cached_prefix(ids),
        )
        if marker(text, "full") is not None:  # Scheduler._abort_on_queued_limit
            self.send_abort(
                req,
                {
                    "type": "abort",
                    "status_code": HTTPStatus.SERVICE_UNAVAILABLE,
                    "message": "The request queue is full.",
                },
            )
            self.record(kind="finished", rid=req.rid, reason="queue full", tokens=0, queued=True)
            return
        self.seen.append(ids)
        self.waiting.append(req)

    def abort(self, msg: AbortReq) -> None:
        """Scheduler.abort_request: a queued request leaves at once (AbortReq to the tokenizer); a running one
        finishes at its next step with FINISH_ABORT. A rid matches by prefix, as SGLang's does."""
        self.record(kind="abort", rid=msg.rid, abort_all=msg.abort_all, finished_reason=msg.finished_reason)
        for req in list(self.waiting):
            if msg.abort_all or req.rid.startswith(msg.rid):
                self.waiting.remove(req)
                self.send_abort(req, msg.finished_reason)
                self.record(kind="finished", rid=req.rid, reason=msg.finished_reason, tokens=0, queued=True)
        for req in self.running:
            if msg.abort_all or req.rid.startswith(msg.rid):
                req.finish = FINISH_ABORT().to_json()

    def send_abort(self, req: Req, finished_reason: dict | None) -> None:
        sock_send(self.to_tokenizer, AbortReq(rid=req.rid, finished_reason=finished_reason))

    # -- a decode step ---------------------------------------------------------------------------
    def step(self) -> None:
        now = time.monotonic()
        for req in list(self.waiting):
            if req.queued_until <= now:
                self.waiting.remove(req)
                self.running.append(req)
        batch = []
        for req in self.running:
            if req.finish is None:
                req.output.append(req.reply[len(req.output)])
                params = req.msg.sampling_params
                if req.output[-1] == self.eos:
                    req.finish = FINISH_MATCHED_TOKEN(matched=self.eos).to_json()
                elif len(req.output) >= params.max_new_tokens:
                    req.finish = FINISH_LENGTH(length=params.max_new_tokens).to_json()
                elif marker(req.text, "retract") is not None and len(req.output) == 4:
                    # ScheduleBatch.retract_decode without a KV backup: a system abort mid-stream
                    req.finish = FINISH_ABORT(
                        "Retracted under decode memory pressure without a KV backup. Retry later.",
                        status_code=HTTPStatus.SERVICE_UNAVAILABLE,
                    ).to_json()
            batch.append(req)
        if batch:
            sock_send(self.to_detokenizer, self.output(batch))
        for req in batch:
            if req.finish is not None:
                self.record(kind="finished", rid=req.rid, reason=req.finish, tokens=len(req.output))
        self.running = [r for r in self.running if r.finish is None]

    def output(self, batch: list[Req]) -> BatchTokenIDOutput:
        """As OutputStreamer builds it: the ids since the last send, for SGLang's incremental detokenizer."""
        decode_ids, read_offsets, output_ids = [], [], []
        for req in batch:
            if not req.surr:  # the first send: the prompt's last ids, then the output
                ids = list(req.msg.input_ids)
                start = max(len(ids) - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
                req.surr = ids[start:] + req.output
                req.read_offset = len(ids) - start
            else:
                req.surr = req.surr + req.output[req.sent_out :]
            decode_ids.append(req.surr[req.sent_ids :])
            req.sent_ids = len(req.surr)
            output_ids.append(req.output[req.sent_out :])
            req.sent_out = len(req.output)
            read_offsets.append(req.read_offset)
        n = len(batch)
        return BatchTokenIDOutput(
            rids=[r.rid for r in batch],
            http_worker_ipcs=[r.msg.http_worker_ipc for r in batch],
            finished_reasons=[r.finish for r in batch],
            decoded_texts=[""] * n,
            decode_ids=decode_ids,
            read_offsets=read_offsets,
            output_ids=output_ids,
            skip_special_tokens=[r.msg.sampling_params.skip_special_tokens for r in batch],
            spaces_between_special_tokens=[r.msg.sampling_params.spaces_between_special_tokens for r in batch],
            no_stop_trim=[r.msg.sampling_params.no_stop_trim for r in batch],
            prompt_tokens=[len(r.msg.input_ids) for r in batch],
            reasoning_tokens=[0] * n,
            completion_tokens=[len(r.output) for r in batch],
            cached_tokens=[r.cached for r in batch],
            input_token_logprobs_val=[],
            input_token_logprobs_idx=[],
            output_token_logprobs_val=[],
            output_token_logprobs_idx=[],
            input_top_logprobs_val=[],
            input_top_logprobs_idx=[],
            output_top_logprobs_val=[],
            output_top_logprobs_idx=[],
            input_token_ids_logprobs_val=[],
            input_token_ids_logprobs_idx=[],
            output_token_ids_logprobs_val=[],
            output_token_ids_logprobs_idx=[],
            output_token_entropy_val=None,
            output_token_sampling_mask=None,
            output_hidden_states=[],
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=None,
            placeholder_tokens_val=None,
            retraction_counts=[0] * n,
            cached_tokens_details=[None] * n,
            dp_ranks=[0] * n,
        )


def run(server_args, port_args, gpu_id, tp_rank, pp_rank, dp_rank, pipe_writer, *_args, **_kwargs):
    """SGLang's `run_scheduler_process` signature: set up, say ready (what Scheduler.get_init_info says), loop."""
    scheduler = Scripted(server_args, port_args, os.environ["PARLEY_SCRIPTED_LOG"])
    pipe_writer.send(
        {
            "status": "ready",
            "max_total_num_tokens": MAX_TOTAL_TOKENS,
            "max_req_input_len": MAX_INPUT,
            "startup_time": {},
            "hicache_object_layout": None,
        }
    )
    while True:
        scheduler.receive()
        scheduler.step()
        time.sleep(STEP_S)


def main() -> None:
    """SGLang's server (`launch_server`: its HTTP server, tokenizer manager and detokenizer) on this scheduler,
    its arguments parsed by SGLang's own CLI (`sglang serve`'s flags)."""
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    launch_server(prepare_server_args(sys.argv[1:]), run_scheduler_process_func=run)


if __name__ == "__main__":
    main()
