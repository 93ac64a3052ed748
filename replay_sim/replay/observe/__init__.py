"""What a replay shows about itself: counts and latencies (:mod:`.metrics`), readiness (:mod:`.readiness`)."""
