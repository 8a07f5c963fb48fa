"""Gradio app: classify an image and show where the ViT looked. (Placeholder until the app lands.)"""

if __name__ == "__main__":
    raise SystemExit("The app is not built yet; see the README.")
