"""Voice on a tower: speech to text (faster-whisper, CTranslate2) and text to speech (espeak-ng), with the codecs that carry audio over slow links.

Uses `node` and `links`; the tower composes it (tower/voice.py), the client uses its codecs.
"""
