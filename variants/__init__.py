"""Everything that is not the paper's path: the released code's rules, the baselines, the rules beyond the
paper, the hint sources other than the expert's, the loss terms beside the paper's and the players of the probe
and SFT baselines. Each is an object that the config names and config.variant looks up once, at setup; the
core never imports this package otherwise."""
