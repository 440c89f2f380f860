"""Reference systems kvgate is measured against, run from their own virtual environments, and the
checks that kvgate agrees with them (Dynamo's router decisions, lm-eval scores)."""
