"""How vLLM is started: the one launcher, the supervisor of `tuned serve`, prompts."""
