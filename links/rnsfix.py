"""Version-guarded fixes for two send-before-register races in RNS 0.9.4.

The grid pins rns==0.9.4 (the last MIT release). That release registers two
things *after* sending the packet that makes the peer answer; on a fast link
the answer can arrive first and is then lost:

1. ``Link.request`` sends the request packet and only then builds the
   ``RequestReceipt`` that appends itself to ``link.pending_requests``. A
   response handled in between finds no pending request and is dropped; the
   caller times out.  Fix: a per-link lock held across send-and-register, which
   ``Link.handle_response`` takes too, so a response waits the microseconds
   until its receipt exists.
2. ``Resource.__advertise_job`` sends the advertisement and only then calls
   ``link.register_outgoing_resource``. The receiver's first part request,
   arriving in between, matches no outgoing resource and is ignored; the
   transfer stalls until the receiver's retry (~3 s).  Fix: register the
   resource before the advertisement goes out.

``apply()`` is idempotent and patches nothing on any other RNS version.
"""

import threading
import time

import RNS

AFFECTED_VERSIONS = ("0.9.4",)

_applied = False
_guard = threading.Lock()


def applies_to(version=None):
    """True when the running (or given) RNS version carries both races."""
    return (version or RNS.__version__) in AFFECTED_VERSIONS


def apply():
    """Install both fixes if the running RNS is an affected version.

    Returns True when the fixes are active after the call.
    """
    global _applied
    with _guard:
        if _applied:
            return True
        if not applies_to():
            return False
        _fix_request_reply_race()
        _fix_resource_advertise_race()
        _applied = True
        return True


_guard_links = threading.Lock()


def _link_lock(link):
    lock = link.__dict__.get("_rngrid_request_lock")
    if lock is None:
        with _guard_links:
            lock = link.__dict__.setdefault("_rngrid_request_lock", threading.RLock())
    return lock


def _fix_request_reply_race():
    # Race 1 (see module docstring): response handled before RequestReceipt registered.
    original_request = RNS.Link.request
    original_handle_response = RNS.Link.handle_response

    def request(self, *args, **kwargs):
        with _link_lock(self):
            return original_request(self, *args, **kwargs)

    def handle_response(self, *args, **kwargs):
        with _link_lock(self):
            return original_handle_response(self, *args, **kwargs)

    request.__doc__ = original_request.__doc__
    RNS.Link.request = request
    RNS.Link.handle_response = handle_response


def _fix_resource_advertise_race():
    # Race 2 (see module docstring): part request arrives before the resource is registered.
    def advertise_job(self):
        self.advertisement_packet = RNS.Packet(
            self.link, RNS.ResourceAdvertisement(self).pack(), context=RNS.Packet.RESOURCE_ADV
        )
        while not self.link.ready_for_new_resource():
            self.status = RNS.Resource.QUEUED
            time.sleep(0.25)

        try:
            self.last_activity = time.time()
            self.started_transferring = self.last_activity
            self.adv_sent = self.last_activity
            self.rtt = None
            self.status = RNS.Resource.ADVERTISED
            self.retries_left = self.max_adv_retries
            self.link.register_outgoing_resource(self)
            self.advertisement_packet.send()
        except Exception as e:
            RNS.log("Could not advertise resource, the contained exception was: " + str(e), RNS.LOG_ERROR)
            self.cancel()
            return

        self.watchdog_job()

    RNS.Resource._Resource__advertise_job = advertise_job
