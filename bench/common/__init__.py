"""What the bench scripts share: the results folder and the command of a run (``results``), the leaderboard suite's
runs (``suite``), a recorded tree played out (``trees``), replay rows (``replay_rows``)."""
