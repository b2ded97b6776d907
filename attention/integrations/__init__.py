"""Optional integrations with other libraries. Each submodule imports its library lazily, so
``import attention`` never needs them."""
