"""Self-contained HTML pages of a study (``reports/index.html``) and of a comparison
(``tailkit compare A B --html FILE``): data, scripts and styles inline, no request leaves them."""
