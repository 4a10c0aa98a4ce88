"""The federated methods, one package each.

:func:`fedray.core.registry.discover` imports every sub-package of ``fedray/methods/``; a method
registers itself there with :func:`fedray.core.registry.register_method`. A new method is a new
package here (or an installed ``fedray.plugins`` entry point), with no edit anywhere else;
:mod:`fedray.methods.base` holds the interfaces they implement.
"""
