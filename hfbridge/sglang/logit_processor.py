"""`HFBridgeLogitProcessor`: hfbridge's chain inside SGLang, per request.

SGLang's interface (`sglang.srt.sampling.custom_logit_processor.CustomLogitProcessor`) is one call,
`__call__(logits, custom_param_list)`, made by SGLang's sampler for the rows whose requests name the
processor (sent as `HFBridgeLogitProcessor.to_str()`); the work is `_calls.Requests.process`'. The
state kept between calls (checked options, stateful samplers) is held by the class, as SGLang may
make a new instance per batch. A request whose options fail is ended by SGLang with an error naming
the option (`FINISH_ABORT`, HTTP 400), and the server keeps serving the others.

>>> HFBridgeLogitProcessor.check_params({"top_kk": 5})
Traceback (most recent call last):
...
ValueError: `top_kk` is not an hfbridge option SGLang requests take. Did you mean `top_k`? ...
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, ClassVar

import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

from hfbridge.sglang._calls import Requests
from hfbridge.sglang._custom_params import check_params

__all__ = ["HFBridgeLogitProcessor"]


def _abort(req: Any, message: str) -> None:
    """End the request at its next step with the message (SGLang returns it to the client, HTTP 400)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    req.to_finish = FINISH_ABORT(f"hfbridge: {message}", status_code=HTTPStatus.BAD_REQUEST,
                                 err_type="BadRequestError")


class HFBridgeLogitProcessor(CustomLogitProcessor):
    """hfbridge's samplers and HF's processors for the SGLang requests that ask for them.

    Start the server with `--enable-custom-logit-processor`; send `HFBridgeLogitProcessor.to_str()` as
    a request's `custom_logit_processor` and hfbridge's options as its `custom_params`
    (`{"dry_multiplier": 0.8, "top_n_sigma": 1.0}`), with SGLang's `temperature` at 1.0 (SGLang samples
    from hfbridge's scores) or 0 (greedy). See `docs/sglang.md`.
    """

    requests: ClassVar[Requests] = Requests(fail=_abort)

    def __call__(self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None) -> torch.Tensor:
        """hfbridge's scores for the rows whose requests have options `(rows, vocab)`; the others untouched."""
        if not custom_param_list:
            return logits
        return type(self).requests.process(logits, custom_param_list)

    @staticmethod
    def check_params(custom_params: Mapping[str, Any], sampling_params: Any = None) -> None:
        """Check a request's options before sending it (the error names the option); SGLang's sampling
        fields too when `sampling_params` (SGLang's `SamplingParams`, or its fields as a dict) is given."""
        if isinstance(sampling_params, Mapping):
            from sglang.srt.sampling.sampling_params import SamplingParams

            sampling_params = SamplingParams(**sampling_params)
        check_params(custom_params, sampling_params)
