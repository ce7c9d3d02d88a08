"""Voice on a tower: speech to text (faster-whisper) and text to speech (espeak-ng), and the audio codecs.

Uses `inference` (admission), `node` and `links`; the tower composes it (tower/voice.py), the client uses its codecs.
"""
