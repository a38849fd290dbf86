"""NVlabs EDM checkpoints without their code: a restricted reader of EDM's network pickles and our re-implementation
of the networks they hold (``EDMPrecond`` / ``VPPrecond`` / ``VEPrecond`` around ``SongUNet`` or ``DhariwalUNet``)."""
from .networks import DhariwalUNet, SongUNet
from .pickle_loader import (EDMUnpickler, PersistentRecord, UnsafePickleError, load_edm_network, read_edm_pickle,
                            record_state_dict)
from .precond import PRECONDITIONERS, EDMPrecond, VEPrecond, VPPrecond

__all__ = ["SongUNet", "DhariwalUNet", "EDMPrecond", "VPPrecond", "VEPrecond", "PRECONDITIONERS", "EDMUnpickler",
           "PersistentRecord", "UnsafePickleError", "read_edm_pickle", "load_edm_network", "record_state_dict"]
