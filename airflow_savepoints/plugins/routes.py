"""Where the plugin is mounted: the API server serves the app below ``URL_PREFIX``, the UI opens its page at ``UI_ROUTE``."""

URL_PREFIX = "/savepoints"  # the API server mounts the app here (below [api] base_url's path)
UI_ROUTE = "savepoints"  # the UI opens the page at <base_url>/plugin/savepoints (3.3.2: .../savepoints/ui)
