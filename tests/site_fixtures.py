"""What the site-knowledge tests share: a root cause a site adds to the taxonomy."""

SITE_TAXONOMY = """root_causes:
  metrics_endpoint_slow:
    category: software
    component: site metrics service
    question: Does the training step wait on our metrics endpoint?
    runbook: https://wiki.example.com/metrics-endpoint
"""
