"""Trace replay: `ctxfold replay`, a provider prompt-cache simulator, cost tables and baseline
context policies. The pure parts (trace, simulator, prices, baselines, metrics, report) do no I/O;
`runner` drives a real server over gRPC (its calls in `rpc`, its server in `connection`, what each
Prepare stands for in `model_calls`, its inputs in `options`) and `plot` draws with matplotlib."""
