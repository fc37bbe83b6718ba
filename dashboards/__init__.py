"""specserve's Grafana dashboards as code (grafana-foundation-sdk): one module per dashboard, one function per
panel, PromQL built from ``specserve.metrics_catalog``. ``python -m dashboards generate`` writes the JSON that
is committed under ``dashboards/json/``; ``python -m dashboards render`` draws every panel from a live
Prometheus with matplotlib."""
