"""Models a job needs besides the policy it trains, at run time: the reference model of dpo and ipo (live, or its
log-probabilities precomputed). Where each lives is a plan dimension of the capability table
(``config/capabilities/reference.py``); an objective's spec names the roles it needs (``ObjectiveSpec.roles``)."""
