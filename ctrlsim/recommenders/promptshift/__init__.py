"""PromptShift's protocol core (Gan & Dong): everything but the env, the runner and the tables.

    defaults    the paper's setting (N, K, |H_u|, p, rho, positives, match thresholds), defined once
    data        `PromptShiftData`: split, positives, eligible users, slices, slice table;
                `UserProfile` (one user's share, asked once); `sample_users`
    generation  prompts, list parsing, batched generation (`LLMListGenerator`)
    engine      `PromptShiftEngine`: title matching, the list cache, scoring a reordering
    rerankers   B0-B3 and `select_params`
    selection   validation-set selection of the match threshold and B3, per-user evaluation

The metrics are pure functions in `ctrlsim.metrics.promptshift`; the title matcher,
shared with the data loaders, is `ctrlsim.data.matching`. The Gymnasium env
(`ctrlsim.envs.promptshift_env`) and the runner (`ctrlsim.experiments.promptshift.runner`,
with its tables in `promptshift.report`) are thin layers over this package. Nothing is
re-exported here: import from the submodule that defines a name.
"""
