"""Cost models: how long a stage takes on a step plan, a link on a payload, the CPU on a step."""
