"""What users run and rerun: the leaderboard suites, the peers, the speed measurements."""
