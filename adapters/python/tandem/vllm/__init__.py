"""vLLM drop-ins: TandemScheduler (--scheduler-cls tandem.vllm.TandemScheduler) and
TandemConnector. Importing this subpackage requires vllm."""
