"""models: what is learned (Problem features, cost model, analytic priors, threshold tables)."""
